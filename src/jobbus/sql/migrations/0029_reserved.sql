-- Stands for the migration numbered 0029 on another branch, so this branch's 0030 and 0031 apply in order;
-- removed when that branch merges.
SELECT 1;
