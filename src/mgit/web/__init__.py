"""Pages over a repository: the lineage graph as a self-contained interactive HTML file
(`render_html`), as Graphviz DOT (`render_dot`). Everything renders from library results;
nothing here touches the store."""

from mgit.web.graph import graph_json, page_data, render_dot, render_html

__all__ = ["graph_json", "page_data", "render_dot", "render_html"]
