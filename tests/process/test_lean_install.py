"""pip's resolver, asked for `pip install recovery-ext` with no extras, pulls in none of the LLM, OCR, webserver or
classified libraries: a resolve in a subprocess that takes seconds to minutes, so it runs in tests/process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from lean_install import CLASSIFIED_LIBRARIES, HEAVY

ROOT = Path(__file__).resolve().parents[2]


# pip's resolver, run whole in a subprocess, takes minutes on a loaded machine: the suite's default 300 s limit
# would fail it there although the answer is right; its own subprocess limit still bounds it.
@pytest.mark.timeout(900)
def test_a_fresh_install_of_the_core_pulls_in_no_llm_ocr_webserver_or_classified_library(tmp_path):
    """The resolver's own answer for `pip install recovery-ext` (no extras), from this checkout."""
    report = tmp_path / "report.json"
    subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                    "--report", str(report), str(ROOT)], check=True, timeout=600)
    installed = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert {"dagster", "sqlalchemy", "psycopg", "tenacity", "click", "recovery-ext"} <= installed
    assert installed & HEAVY == set()
    assert installed & CLASSIFIED_LIBRARIES == set()
    assert not {name for name in installed if name.startswith("opentelemetry")}
