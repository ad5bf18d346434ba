# What metax-audit keeps on disk between runs: the cache root, the result store and the kept snapshot
# of staged reviews. The per-stage memos live in their stages (checks/memo.py, compare/memo.py...).
