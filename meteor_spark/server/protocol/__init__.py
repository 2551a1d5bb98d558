"""The wire protocol of the embedded member: frames, codecs declared as data, the message table, errors."""
