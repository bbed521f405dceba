"""The HTTP server (`blazr serve`): OpenAI's, Anthropic's and Ollama's APIs over one chat-format core
(chat_format.py, chat_run.py), FastAPI app, routes, schemas, metrics.

Entry points: `blazr.server.app.build_app(ServerConfig)` and `blazr.server.app.serve(args)`. The engine runs
on its own thread (`blazr.engine.async_engine.AsyncEngine`); nothing here imports torch or `blazr.model`.
"""
