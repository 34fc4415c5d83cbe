-- A provider job submitted one part at a time (an Azure analysis per document: no idempotency key, no listing)
-- records each part as it goes, while the job is still `submitting`: {"accepted": {item: the provider's id of
-- its part}, "sending": the item whose submission may be on its way}. A resume re-uses the accepted parts and
-- submits only the rest; the one part that was on its way is the only one that may have been paid twice.
ALTER TABLE rx_provider_jobs ADD COLUMN parts TEXT;
