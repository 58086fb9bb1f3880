"""AG News as the trainer reads it: rows read and checked (local CSV or the Hugging Face hub), a split
and a seeded sample of it, tokenized once into a cache, sampled per rank and collated into
padded batches. Importing this package imports none of them.
"""
