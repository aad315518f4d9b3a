"""ORT checkpoint files ("ODTC" FlatBuffers) and safetensors files."""
