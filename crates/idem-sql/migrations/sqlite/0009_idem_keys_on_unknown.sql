-- A leased key record's policy for an unknown outcome ("reforward",
-- "verify", "reject"; NULL for records of the other claim paths): what a
-- retry does when the holder's work may have landed with no answer, and
-- whether an operator may release the record without checking upstream.
ALTER TABLE idem_keys ADD COLUMN on_unknown TEXT;
