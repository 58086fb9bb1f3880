"""The app's POST routes, declared once: ``openapi`` registers them, and nginx in front of ``serve-replicas``
(``nginx``) passes each one that failed on a replica (refused, reset, 502, 503) to the next replica.

Every POST route of the app classifies the texts of its body and keeps nothing: answering it twice changes
nothing, so resending it on another replica can lose nothing and double nothing (nginx's ``non_idempotent``). A
POST route that changes state (one that is not a pure function of its body) must not be listed here, and nginx
then never resends it; tests/unit/test_nginx_conf.py fails until each POST route of the app is one or the other.
"""

from __future__ import annotations

# POST /predict, and where text-embeddings-inference serves a classifier too (its POST / and /invocations)
PREDICT_PATHS = ("/predict", "/", "/invocations")
PREDICT_BATCH_PATH = "/predict/batch"
# The POST routes nginx resends to another replica when one fails them
RETRIED_POST_PATHS = (*PREDICT_PATHS, PREDICT_BATCH_PATH)
