from simdevice.cli import entry

entry()
