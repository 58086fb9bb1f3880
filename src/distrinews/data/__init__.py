"""The rows a run trains on (AG News or the user's, read and checked, split, tokenized once, sampled per rank and
collated) and the corpora batch inference reads. Importing this package imports none of them.
"""
