-- Placeholder: another branch's migration 0020 takes this number at merge (this file is dropped then).
SELECT 1;
