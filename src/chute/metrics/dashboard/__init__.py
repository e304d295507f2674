"""A live, read-only dashboard over metric runs in the browser (`chute metrics serve`).

Needs the ``dashboard`` extra (starlette, uvicorn); nothing else in chute imports it.
"""

from ._app import create_app
from ._serve import serve

__all__ = ["create_app", "serve"]
