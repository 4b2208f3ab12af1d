from simdevice.command import entry

entry()
