"""What a run leaves on disk and how it is read back: atomic directory writes, the resumable ``step-N``
checkpoints with their manifests, the servable ``best/`` with its model card, the legacy single
``.pt``, the run directory, and running out of space. Importing this package imports none of them:
the slim server imports ``tokenizer_files`` without torch.
"""
