"""What a routed request keeps once its body is on its way to Envoy.

An agent's request can carry a 200,000-token context, and thousands are in flight while their
answers stream. The EPP needs the content to route (parsers, producers, scorers, pre-request
hooks); once the reply holds the body, ``release_content`` drops it from the request, and the
response hooks see what remains:

- ``request.body`` (``RequestBody.release``): ``raw`` is ``b""``, ``payload`` and ``token_ids``
  are ``None``, ``released`` is true; ``kind``, ``stream``, ``max_output_tokens`` and
  ``cache_salt`` stay;
- every ``TokenizedPrompt`` attribute is replaced by its ``count_only`` copy: ``token_count``
  and ``cache_salt`` stay, ``prompts`` is empty;
- every other attribute stays as the plugins left it.

A plugin that needs more of the prompt after routing takes it in ``pre_request`` and keeps it in
its own attribute. ``epp.plugin.testing.check_hooks`` runs the response hooks on a released
request, as the server does.
"""

from __future__ import annotations

from epp.plugin.prefix import TokenizedPrompt
from epp.plugin.types import InferenceRequest


def release_content(request: InferenceRequest) -> None:
    """Drop ``request``'s content as the module docstring says (in place)."""
    if request.body is not None:
        request.body.release()
    attributes = request.attributes
    for key, value in attributes.items():
        if isinstance(value, TokenizedPrompt):
            attributes[key] = value.count_only()
