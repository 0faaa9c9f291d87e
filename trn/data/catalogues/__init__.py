"""Crater catalogues: their CSV files and the union of a source's large- and small-crater
catalogues (:mod:`.catalogue`)."""
