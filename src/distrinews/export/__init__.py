"""A trained checkpoint in other forms: ONNX (fp32 and int8), the Hugging Face Space bundle (a Docker
Space with the slim server and the model), and the reference system's single ``.pt`` file.
"""
