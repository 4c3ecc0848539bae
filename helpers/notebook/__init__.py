"""Notebook support: the first cell's setup, the typed report records, the layout explorer, the
JupyterLab overrides, the figures and the engine source view."""
