"""The OpenAI-compatible HTTP server (`blazr serve`): FastAPI app, routes, schemas, metrics.

Entry points: `blazr.server.app.build_app(ServerConfig)` and `blazr.server.app.serve(args)`. The engine runs
on its own thread (`blazr.engine.async_engine.AsyncEngine`); nothing here imports torch or `blazr.model`.
"""
