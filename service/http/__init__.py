"""The HTTP layer: the Flask app, the OpenAI-compatible API and its models, the web UI, SSE streaming, API keys,
image URLs. It turns requests into the engine's Jobs (service.engine) and their events into responses.
"""
