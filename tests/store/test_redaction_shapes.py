"""Every secret-bearing URL shape is masked wherever a URL goes: the ledger, metrics, status, events, logs.

One case per shape: the parameter names and path shapes that carry a credential in the wild.
"""

from __future__ import annotations

import pytest

from recovery_ext import redact, redact_url
from recovery_ext._store.models import ProviderCall
import store_rows

SECRET = "S3cr3tV4lue9"

SHAPES = {
    "azure functions ?code=": f"https://fn.azurewebsites.net/api/enrich?code={SECRET}==&clientId=default",
    "oauth ?code= mid-query": f"https://app.example.com/callback?state=xyz&code={SECRET}",
    "firebase ?auth=": f"https://proj.firebaseio.com/items.json?auth={SECRET}",
    "?authorization=": f"https://h.example.com/v1?Authorization={SECRET}",
    "?key=": f"https://generativelanguage.googleapis.com/v1/models?key={SECRET}",
    "?token=": f"https://h.example.com/v1?token={SECRET}",
    "?access_token=": f"https://graph.example.com/me?access_token={SECRET}",
    "?api_key=": f"https://h.example.com/v1?api_key={SECRET}",
    "?apikey=": f"https://h.example.com/v1?apikey={SECRET}",
    "?secret=": f"https://h.example.com/v1?client_secret={SECRET}",
    "?password=": f"https://h.example.com/v1?password={SECRET}",
    "azure sas ?sig=": f"https://acct.blob.core.windows.net/c/b?sv=2022&sig={SECRET}%3D",
    "?signature=": f"https://h.example.com/f?Signature={SECRET}&Expires=1",
    "aws ?X-Amz-Signature=": f"https://b.s3.amazonaws.com/k?X-Amz-Signature={SECRET}&X-Amz-Date=1",
    "gcs ?X-Goog-Signature=": f"https://storage.googleapis.com/b/k?X-Goog-Signature={SECRET}",
    "path ;jsessionid=": f"https://legacy.example.com/ocr;jsessionid={SECRET}?page=1",
    "telegram /bot<id>:<token>/": f"https://api.telegram.org/bot123456789:{SECRET}-Ab_c/sendMessage",
    "telegram /bot<id>:<token> at the end": f"https://api.telegram.org/bot123456789:{SECRET}",
    "fragment #access_token=": f"https://app.example.com/cb#access_token={SECRET}&state=1",
    "userinfo password": f"https://user:{SECRET}@h.example.com/v1",
    "api gateway ?user_key=": f"https://api.example.com/v1/chat?user_key={SECRET}",
    "api gateway ?app_id=&app_key=": f"https://api.example.com/v1?app_id=42&app_key={SECRET}",
    "?application_key=": f"https://api.example.com/v1?api_key=x&application_key={SECRET}",
    "?license_key=": f"https://api.example.com/v1?license_key={SECRET}",
    "camelCase ?sessionKey=": f"https://api.example.com/v1?sessionKey={SECRET}",
    "?jwt=": f"https://api.example.com/v1?jwt={SECRET}",
    "?pass=": f"https://api.example.com/v1?user=u&pass={SECRET}",
    "percent-encoded name ?api%5Fkey=": f"https://api.example.com/v1?api%5Fkey={SECRET}",
}


@pytest.mark.parametrize("url", list(SHAPES.values()), ids=list(SHAPES))
def test_each_secret_bearing_url_shape_is_masked_as_a_url_and_in_text(url):
    assert SECRET not in redact_url(url)
    assert SECRET not in redact(f"Server error '503 Service Unavailable' for url '{url}'")
    assert redact_url(url).split("://")[1].split("/")[0].rpartition("@")[2] in url  # the host stays readable


def test_what_is_not_a_secret_stays_readable():
    assert redact("exit code: 503, status code=429, auth failed") == "exit code: 503, status code=429, auth failed"
    assert redact("item_key=doc-1 failed, pass 2") == "item_key=doc-1 failed, pass 2"
    assert redact_url("https://h.example.com/app;jsessionid=x?page=2") .endswith("?page=2")
    assert redact_url("https://h.example.com/v1?model=m&code=1") == "https://h.example.com/v1?model=m&code=***"
    assert redact_url("sqlite:///data/a@b.db") == "sqlite:///data/a@b.db"  # a path, not a password


@pytest.mark.parametrize("url", [f"postgres:{SECRET}@db.example.com/app", f"postgresql:{SECRET}@db/x?sslmode=require",
                                 f"postgres:{SECRET[:4]}?{SECRET[4:]}@db/x", f"postgres:{SECRET}#x@db/x"])
def test_a_url_without_its_slashes_keeps_no_part_of_what_stands_before_its_host(url):
    """A new user's trial and a review: ``postgres:password@host`` (no ``//``) has no userinfo to a URL parser,
    so its password was shown whole, with or without a query string."""
    shown = redact_url(url)
    assert shown.startswith(f"{url.partition(':')[0]}:***@db") and SECRET[:4] not in shown and SECRET[4:] not in shown


def test_a_recorded_endpoint_with_an_azure_functions_key_keeps_no_key(store):
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1", params={})
    store.pipelines.start_node(own, "a")
    call = ProviderCall(endpoint=SHAPES["azure functions ?code="], model="m")
    store.providers.record_provider_calls([ProviderCall(**{**call.__dict__, "pipeline_id": own.pipeline_id})])
    [stored] = store_rows.provider_calls(store, own.pipeline_id)
    assert SECRET not in stored.endpoint and "fn.azurewebsites.net" in stored.endpoint
