"""Writing what a conversion made, and checking it: the artifact formats (formats/, one module each, in one
registry), the export stage that writes and re-runs them (artifacts.py), the serving functions a written
SavedModel answers an empty request with (serving.py), and MLflow runs of a written folder (tracking.py).
"""
