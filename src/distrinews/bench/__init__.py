"""What a user measures on their own setup: training scaling, collective bandwidth, serving load, batch labelling
and where a training step's time goes. Each runs as ``distrinews bench NAME``; comparisons with other systems live
outside the package, in the repository's ``benchmarks/tools``.
"""
