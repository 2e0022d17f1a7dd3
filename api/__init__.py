"""The trl-warmup HTTP API (FastAPI). Entry point: `api.app.create_app(settings)`."""
