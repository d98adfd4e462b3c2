from sdsync.cli.main import app

app(prog_name="sdsync")
