"""Day 1 as it stood: config, a stdlib safetensors reader, and the Llama forward."""
