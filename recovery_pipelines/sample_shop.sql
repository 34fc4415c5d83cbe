-- A small shop: 10 related tables. Two relationships are left undeclared on purpose
-- (support_tickets.customer_id, reviews.product_id) so the naming conventions must find them.
CREATE TABLE customers (
    id INTEGER PRIMARY KEY, email TEXT NOT NULL UNIQUE, full_name TEXT NOT NULL, country TEXT,
    signup_date DATE NOT NULL, loyalty_tier TEXT
);
CREATE TABLE addresses (
    id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers (id), street TEXT NOT NULL,
    city TEXT NOT NULL, postal_code TEXT, country TEXT NOT NULL, is_default BOOLEAN NOT NULL
);
CREATE TABLE categories (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, parent_id INTEGER REFERENCES categories (id)
);
CREATE TABLE products (
    id INTEGER PRIMARY KEY, sku TEXT NOT NULL UNIQUE, name TEXT NOT NULL,
    category_id INTEGER NOT NULL REFERENCES categories (id), unit_price NUMERIC(10, 2) NOT NULL,
    discontinued BOOLEAN NOT NULL
);
CREATE TABLE orders (
    id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers (id), ordered_at TIMESTAMP NOT NULL,
    status TEXT NOT NULL, shipping_address_id INTEGER REFERENCES addresses (id), total_amount NUMERIC(12, 2)
);
CREATE TABLE order_items (
    id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL REFERENCES orders (id),
    product_id INTEGER NOT NULL REFERENCES products (id), quantity INTEGER NOT NULL,
    unit_price NUMERIC(10, 2) NOT NULL
);
CREATE TABLE payments (
    id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL REFERENCES orders (id), method TEXT NOT NULL,
    amount NUMERIC(12, 2) NOT NULL, paid_at TIMESTAMP
);
CREATE TABLE shipments (
    id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL REFERENCES orders (id), carrier TEXT NOT NULL,
    tracking_number TEXT, shipped_at TIMESTAMP, delivered_at TIMESTAMP
);
CREATE TABLE reviews (
    id INTEGER PRIMARY KEY, product_id INTEGER NOT NULL, customer_id INTEGER REFERENCES customers (id),
    rating INTEGER NOT NULL, body TEXT, created_at TIMESTAMP NOT NULL
);
CREATE TABLE support_tickets (
    id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL, order_id INTEGER REFERENCES orders (id),
    subject TEXT NOT NULL, priority TEXT NOT NULL, opened_at TIMESTAMP NOT NULL, closed_at TIMESTAMP
);
