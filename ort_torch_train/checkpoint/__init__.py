"""ORT checkpoint files ("ODTC" FlatBuffers), safetensors files, and the TrainingState."""
