"""The pieces of ``contract/_author.py``: definition tables grouped by meaning.

``build`` assembles them into the three contract files; ``_author.py`` writes or checks them.
"""
