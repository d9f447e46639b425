"""Render CUDA sources from the Jinja templates in ``templates/``.

Family-agnostic: a family passes its template path and the values it computed from its config.
Every generated file starts with ``templates/common/header.j2`` (template, family, kernel name,
config) and none mentions the package version, so a release that leaves a template alone leaves
its generated sources, and their cache entries, as they were.
"""
from __future__ import annotations

import functools

import jinja2

from .._paths import templates_dir


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        autoescape=False,
    )


def render_template(template: str, **context) -> str:
    """The text of ``templates/<template>`` rendered with ``context`` (``template`` is passed on
    for the header). Deterministic: the same context gives the same bytes."""
    return _env().get_template(template).render(template=template, **context)
