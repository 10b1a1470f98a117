"""Sphinx configuration: `make docs` builds docs/ into docs/_build/html, warnings as errors.

The pages are Markdown (MyST); the API reference is autodoc over the docstrings (numpydoc,
through napoleon). The package is imported from the checkout (built in place by `make venv`).
"""

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

project = "cpprb_ray"
author = "cpprb_ray developers"
copyright = "cpprb_ray developers"
release = "0.1.0"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

# Links between pages are written as Markdown links to the .md files (they work on GitHub
# too); headings get anchors so that page.md#section resolves.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
# Links to files outside docs/ (the README, examples/, tests/, benchmarks/) are links into
# the repository, not pages of this site.
myst_url_schemes = ["http", "https", "mailto"]


napoleon_numpy_docstring = True
napoleon_google_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False}

html_theme = "alabaster"
html_static_path: list = []
html_title = "cpprb_ray"
