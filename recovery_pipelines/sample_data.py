"""The demo inputs: a sample shop database and scanned-style PDFs, generated deterministically."""

from __future__ import annotations

import datetime as dt
import json
import os
import random
from importlib import resources
from pathlib import Path

from sqlalchemy import create_engine, inspect, text

DEMO_DIR_ENV = "RECOVERY_DEMO_DIR"

# Declared and conventional relationships of the sample, for tests and the README.
DECLARED_RELATIONSHIPS = {
    ("addresses", "customer_id", "customers", "id"), ("categories", "parent_id", "categories", "id"),
    ("products", "category_id", "categories", "id"), ("orders", "customer_id", "customers", "id"),
    ("orders", "shipping_address_id", "addresses", "id"), ("order_items", "order_id", "orders", "id"),
    ("order_items", "product_id", "products", "id"), ("payments", "order_id", "orders", "id"),
    ("shipments", "order_id", "orders", "id"), ("reviews", "customer_id", "customers", "id"),
    ("support_tickets", "order_id", "orders", "id"),
}
CONVENTIONAL_RELATIONSHIPS = {
    ("reviews", "product_id", "products", "id"), ("support_tickets", "customer_id", "customers", "id"),
}

SCAN_TEXTS = {
    "invoice_1001.pdf": ["INVOICE 1001", "Customer: Ada Lovelace", "Total due: 1250.00 EUR", "Payment within 30 days"],
    "delivery_note_77.pdf": ["DELIVERY NOTE 77", "Carrier: Northwind Freight", "Parcels: 3", "Signed on arrival"],
    "contract_summary.pdf": ["SERVICE CONTRACT", "Start date: 2026-01-15", "Monthly fee: 480 EUR",
                             "Notice period: three months"],
    "purchase_order_5521.pdf": ["PURCHASE ORDER 5521", "Supplier: Contoso Tools", "Quantity: 40 hammers",
                                "Deliver to: Berlin warehouse"],
    "credit_note_204.pdf": ["CREDIT NOTE 204", "Refund for order 318", "Amount: 74.90 EUR", "Reason: damaged parcel"],
    "customs_form_9.pdf": ["CUSTOMS DECLARATION 9", "Origin: Netherlands", "Declared value: 2300 EUR",
                           "Contents: garden tools"],
}


def demo_dir() -> Path:
    return Path(os.environ.get(DEMO_DIR_ENV) or Path.cwd() / "var" / "demo").resolve()


def sample_db_url(folder: Path | None = None) -> str:
    return f"sqlite:///{(folder or demo_dir()) / 'shop.sqlite3'}"


def scans_dir(folder: Path | None = None) -> Path:
    return (folder or demo_dir()) / "scans"


def create_sample_database(url: str, *, seed: int = 7) -> None:
    """Create and fill the sample shop (about 1,500 rows) in an empty database; idempotent."""
    engine = create_engine(url)
    try:
        if "customers" in inspect(engine).get_table_names():
            return
        ddl = resources.files("recovery_pipelines").joinpath("sample_shop.sql").read_text(encoding="utf-8")
        body = "\n".join(line for line in ddl.splitlines() if not line.strip().startswith("--"))
        rng = random.Random(seed)
        with engine.begin() as conn:
            for statement in body.split(";"):
                if statement.strip():
                    conn.exec_driver_sql(statement)
            for table, rows in _rows(rng).items():
                columns = list(rows[0])
                conn.execute(text(f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
                                  f"({', '.join(':' + c for c in columns)})"), rows)
    finally:
        engine.dispose()


def _rows(rng: random.Random) -> dict[str, list[dict]]:
    first = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Radia", "Tim"]
    last = ["Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Allen", "Thompson", "Perlman", "Lee"]
    countries = ["DE", "FR", "NL", "GB", "US", None]
    start = dt.date(2025, 1, 1)
    customers = [{"id": i, "email": f"user{i}@example.com", "full_name": f"{rng.choice(first)} {rng.choice(last)}",
                  "country": rng.choice(countries), "signup_date": start + dt.timedelta(days=rng.randrange(300)),
                  "loyalty_tier": rng.choice(["bronze", "silver", "gold", None])} for i in range(1, 121)]
    addresses = [{"id": i, "customer_id": c["id"], "street": f"{rng.randrange(1, 200)} Market Street",
                  "city": rng.choice(["Berlin", "Paris", "Utrecht", "Leeds", "Boston"]),
                  "postal_code": f"{rng.randrange(10000, 99999)}", "country": c["country"] or "DE",
                  "is_default": True} for i, c in enumerate(customers, start=1)]
    categories = [{"id": 1, "name": "Hardware", "parent_id": None}, {"id": 2, "name": "Tools", "parent_id": 1},
                  {"id": 3, "name": "Garden", "parent_id": None}, {"id": 4, "name": "Lighting", "parent_id": 1},
                  {"id": 5, "name": "Paint", "parent_id": 1}]
    products = [{"id": i, "sku": f"SKU-{i:04d}", "name": f"{rng.choice(['Steel', 'Oak', 'Brass', 'LED'])} "
                 f"{rng.choice(['hammer', 'lamp', 'rake', 'brush', 'hinge'])} {i}", "category_id": rng.randrange(1, 6),
                 "unit_price": round(rng.uniform(2, 250), 2), "discontinued": rng.random() < 0.1}
                for i in range(1, 61)]
    orders, items, payments, shipments = [], [], [], []
    for i in range(1, 301):
        customer = rng.choice(customers)
        ordered = dt.datetime(2025, 6, 1) + dt.timedelta(hours=rng.randrange(4000))
        lines = [(rng.choice(products), rng.randrange(1, 5)) for _ in range(rng.randrange(1, 4))]
        total = round(sum(p["unit_price"] * q for p, q in lines), 2)
        status = rng.choice(["placed", "paid", "shipped", "delivered", "cancelled"])
        orders.append({"id": i, "customer_id": customer["id"], "ordered_at": ordered, "status": status,
                       "shipping_address_id": customer["id"], "total_amount": total})
        for p, q in lines:
            items.append({"id": len(items) + 1, "order_id": i, "product_id": p["id"], "quantity": q,
                          "unit_price": p["unit_price"]})
        if status != "placed":
            payments.append(
                {
                    "id": len(payments) + 1,
                    "order_id": i,
                    "method": rng.choice(["card", "invoice", "paypal"]),
                    "amount": total,
                    "paid_at": ordered + dt.timedelta(hours=2),
                }
            )
        if status in ("shipped", "delivered"):
            shipments.append({"id": len(shipments) + 1, "order_id": i, "carrier": rng.choice(["DHL", "UPS", "PostNL"]),
                              "tracking_number": f"TRK{rng.randrange(10**8):08d}",
                              "shipped_at": ordered + dt.timedelta(days=1),
                              "delivered_at": ordered + dt.timedelta(days=3) if status == "delivered" else None})
    reviews = [
        {
            "id": i,
            "product_id": rng.choice(products)["id"],
            "customer_id": rng.choice(customers)["id"],
            "rating": rng.randrange(1, 6),
            "body": rng.choice(["Great", "Broke after a week", "As described", None]),
            "created_at": dt.datetime(2025, 9, 1) + dt.timedelta(hours=rng.randrange(2000)),
        }
        for i in range(1, 151)
    ]
    tickets = [{"id": i, "customer_id": rng.choice(customers)["id"], "order_id": rng.choice(orders)["id"],
                "subject": rng.choice(["Late delivery", "Wrong item", "Refund request", "Invoice copy"]),
                "priority": rng.choice(["low", "normal", "high"]),
                "opened_at": dt.datetime(2025, 10, 1) + dt.timedelta(hours=rng.randrange(900)),
                "closed_at": None} for i in range(1, 61)]
    return {"customers": customers, "addresses": addresses, "categories": categories, "products": products,
            "orders": orders, "order_items": items, "payments": payments, "shipments": shipments,
            "reviews": reviews, "support_tickets": tickets}


def create_scanned_pdfs(folder: Path, texts: dict[str, list[str]] | None = None) -> dict[str, str]:
    """Render text to an image and save it as a PDF: no text layer, as from a scanner."""
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    texts = texts or SCAN_TEXTS
    folder.mkdir(parents=True, exist_ok=True)
    font = ImageFont.load_default(size=34)
    expected: dict[str, str] = {}
    for name, lines in texts.items():
        path = folder / name
        expected[name] = "\n".join(lines)
        if path.exists():
            continue
        page = Image.new("L", (1240, 1754), color=255)  # A4 at 150 dpi
        draw = ImageDraw.Draw(page)
        for row, line in enumerate(lines):
            draw.text((110, 160 + row * 80), line, fill=0, font=font)
        page = page.rotate(0.4, fillcolor=255).filter(ImageFilter.GaussianBlur(0.6))  # a slightly skewed scan
        page.convert("RGB").save(path, "PDF", resolution=150.0)
    _write_manifest(folder, expected)
    return expected


def _write_manifest(folder: Path, expected: dict[str, str]) -> None:
    manifest = folder / "expected.json"
    text = json.dumps(expected, indent=2)
    if not manifest.exists() or manifest.read_text() != text:
        manifest.write_text(text)


def add_scanned_documents(folder: Path, count: int) -> list[str]:
    """``count`` new scans in ``folder`` (never a name already there), added to its manifest: new work
    for the OCR queue, whose earlier documents are already done. Returns their names."""
    folder.mkdir(parents=True, exist_ok=True)
    taken = {p.name for p in folder.iterdir()}
    numbers = (n for n in range(1, 10**9) if f"letter_{n:04d}.pdf" not in taken)
    texts = {}
    for n in (next(numbers) for _ in range(count)):
        texts[f"letter_{n:04d}.pdf"] = [f"LETTER {n}", f"Reference: DEMO-{n:04d}", "Please process this scan",
                                        "Pages: 1 of 1"]
    manifest = folder / "expected.json"
    known = json.loads(manifest.read_text()) if manifest.exists() else {}
    create_scanned_pdfs(folder, texts)
    _write_manifest(folder, {**known, **{name: "\n".join(lines) for name, lines in texts.items()}})
    return list(texts)


def prepare_demo(folder: Path | None = None) -> dict[str, str]:
    folder = folder or demo_dir()
    folder.mkdir(parents=True, exist_ok=True)
    create_sample_database(sample_db_url(folder))
    create_scanned_pdfs(scans_dir(folder))
    return {"sample_database": sample_db_url(folder), "scans": str(scans_dir(folder))}
