"""The REST API and dashboard of tuner: studies, trials, measurements, best config, artifacts, live events.

``api.app.create_app(ApiSettings(...))`` builds the FastAPI app; it imports ``storage`` and ``optuna``, never
``tuner``.
"""
