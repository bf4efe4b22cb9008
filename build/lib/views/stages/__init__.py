"""The page scripts, one per row of views/pages.py (Streamlit runs each as a script)."""
