"""The bundled text-to-SQL data and the script that builds it (`build.py`)."""
