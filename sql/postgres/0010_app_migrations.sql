-- Applied migrations of applications' own packages, numbered apart from the library's.
CREATE TABLE IF NOT EXISTS rx_app_migrations (
    package     TEXT NOT NULL,
    version     INTEGER NOT NULL,
    name        TEXT NOT NULL,
    applied_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (package, version)
);
