"""Model folders the harness serves: a config.json (and, for weight updates,
a tiny safetensors checkpoint), written on demand. No hub, no tokenizer."""
