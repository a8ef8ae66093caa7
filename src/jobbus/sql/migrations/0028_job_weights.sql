-- The weight column (`weight=`, SPEC 21) and its schedule_job; this number is kept for it.
SELECT 1;
