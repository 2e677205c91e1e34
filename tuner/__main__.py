from tuner.cli import app

app()
