-- The checkout demo: stock per SKU and orders, each order the work of one
-- run (its id is the run's suffix).
CREATE TABLE demo_inventory (
    tenant_id     TEXT   NOT NULL,
    sku           TEXT   NOT NULL,
    available     BIGINT NOT NULL CHECK (available >= 0),
    reserved      BIGINT NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    version       BIGINT NOT NULL DEFAULT 1,
    updated_at_ms BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, sku)
);
CREATE TABLE demo_orders (
    tenant_id     TEXT   NOT NULL,
    id            TEXT   NOT NULL,
    customer      TEXT   NOT NULL,
    sku           TEXT   NOT NULL,
    quantity      BIGINT NOT NULL CHECK (quantity > 0),
    amount        BIGINT NOT NULL CHECK (amount > 0),
    currency      TEXT   NOT NULL,
    email         TEXT   NOT NULL,
    status        TEXT   NOT NULL CHECK (status IN ('pending', 'confirmed', 'failed')),
    reason        TEXT,
    payment_id    TEXT,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX demo_orders_customer ON demo_orders (tenant_id, customer, created_at_ms);
