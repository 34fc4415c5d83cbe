-- Placeholder: the number 0019 belongs to another branch; this file goes when that branch is merged.
SELECT 1;
