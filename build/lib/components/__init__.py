"""Plain data -> Plotly figures, HTML and images. No model calls here."""
