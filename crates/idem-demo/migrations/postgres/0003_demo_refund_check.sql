-- Refunds never exceed the payment, also across idempotency keys. NOT VALID:
-- every new or updated row is checked; rows written before the check (an
-- over-refund from the race this closes) do not stop the upgrade.
ALTER TABLE demo_payments ADD CONSTRAINT demo_payments_refund_within_amount
    CHECK (amount_refunded >= 0 AND amount_refunded <= amount) NOT VALID;
