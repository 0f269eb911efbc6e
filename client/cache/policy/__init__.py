"""What the cache keeps and what it evicts: LRU, LFU, and SCALM's semantic patterns.

Only the policy names live here, so settings can check a value without importing
scikit-learn; the machinery is in the modules beside this one.
"""

POLICIES = ("lru", "lfu", "scalm-co", "scalm-se")
CLUSTERINGS = ("kmeans", "dbscan")
