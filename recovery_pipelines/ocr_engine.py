"""Page rendering (pypdfium2) and recognition (RapidOCR on ONNX Runtime, models shipped in the wheel)."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp"}
DOCUMENT_SUFFIXES = {".pdf", *IMAGE_SUFFIXES}

_engine = None
_engine_lock = threading.Lock()


def engine():
    """One RapidOCR engine per process; its models load from the installed package, never a download."""
    global _engine
    with _engine_lock:
        if _engine is None:
            from rapidocr_onnxruntime import RapidOCR

            _engine = RapidOCR()
        return _engine


def model_files() -> list[Path]:
    import rapidocr_onnxruntime

    return sorted((Path(rapidocr_onnxruntime.__file__).parent / "models").glob("*.onnx"))


@dataclass(frozen=True)
class OcrResult:
    raw_text: str
    boosted_text: str
    pages: int
    confidence: float


def render_pages(path: Path, *, scale: float = 2.0):
    """PIL images of a document's pages: PDF pages rendered by PDFium, images as they are."""
    from PIL import Image

    if path.suffix.lower() in IMAGE_SUFFIXES:
        with Image.open(path) as image:
            return [image.convert("RGB")]
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(str(path))
    try:
        return [pdf[i].render(scale=scale).to_pil().convert("RGB") for i in range(len(pdf))]
    finally:
        pdf.close()


def recognise(path: Path, *, on_page=None) -> OcrResult:
    import numpy as np

    lines: list[str] = []
    scores: list[float] = []
    pages = render_pages(path)
    for number, page in enumerate(pages, start=1):
        found, _ = engine()(np.asarray(page))
        # RapidOCR returns [box, text, score]; sort top-to-bottom, then left-to-right.
        for _box, text, score in sorted(found or [], key=lambda r: (round(r[0][0][1] / 20), r[0][0][0])):
            lines.append(text)
            scores.append(float(score))
        if on_page is not None:
            on_page(number, len(pages))
    raw = "\n".join(lines)
    return OcrResult(raw, boost(raw), len(pages), sum(scores) / len(scores) if scores else 0.0)


def boost(raw: str) -> str:
    """The cleaned ("boosted") text: whitespace normalised, hyphenation joined, empty lines dropped."""
    text = re.sub(r"-\n(\w)", r"\1", raw)
    text = re.sub(r"[ \t]+", " ", text)
    text = re.sub(r"\s*:\s*", ": ", text)
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())
