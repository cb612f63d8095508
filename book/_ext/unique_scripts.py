"""A Sphinx extension of this book: each script tag appears once per page.

jupyter-book 1.x adds some inline scripts twice, once with no file name and once with an empty
one, so Sphinx does not see that they are the same. The second copy of sphinx-thebe's
configuration stops with "Identifier 'THEBE_JS_URL' has already been declared" in every
page's console.
This drops repeated scripts (same file and same inline body) from each page before it is
written. The browser test in tests/test_book.py fails on any script error.
"""


def unique_scripts(app, pagename, templatename, context, doctree):
    seen, kept = set(), []
    for script in context.get("script_files", []):
        key = (str(script.filename or ""), script.attributes.get("body", ""))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    context["script_files"] = kept


def setup(app):
    app.connect("html-page-context", unique_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
