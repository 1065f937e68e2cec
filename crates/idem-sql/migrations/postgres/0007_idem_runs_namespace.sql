-- The installation's namespace, part of every id its runs derive (drawn on
-- first use), so installations that share a provider never share keys.
CREATE TABLE idem_meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
-- Failed attempts of a step (an error answer or a timeout): what a retry
-- budget counts. Attempts cut short by a crash are not failures.
ALTER TABLE idem_run_steps ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
