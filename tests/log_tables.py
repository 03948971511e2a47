"""The Day-58 lab log's coverage table, exactly as printed: one copy for every test."""

# The Day-58 table as the log prints it, spaces included (header, then both schedulers).
LOG_COVERAGE = """\
     batch  slots  requests    gen lengths  decode steps  replayed  scattered   share  moves   cells
 free rows      4         8             16            30        30          0   100%      0       0
 free rows      4         8           8/16            31        21         10    68%      0       0
 free rows      4         8           4/32            43        36          7    84%      0       0
 free rows      8        16             16            30        30          0   100%      0       0
 free rows      8        16           8/16            31        14         17    45%      0       0
 free rows      8        16           4/32            47        35         12    74%      0       0
 free rows      8        16      4/8/16/32            47        12         35    26%      0       0
 free rows     16        32           4/32            51        34         17    67%      0       0
persistent      4         8             16            30        30          0   100%      0       0
persistent      4         8           8/16            31        31          0   100%      3      33
persistent      4         8           4/32            43        43          0   100%      5      95
persistent      8        16             16            30        30          0   100%      0       0
persistent      8        16           8/16            31        31          0   100%      6      66
persistent      8        16           4/32            47        47          0   100%     11     217
persistent      8        16      4/8/16/32            47        47          0   100%      8      80
persistent     16        32           4/32            51        51          0   100%     23     461
"""
