"""Decoders as their users export them: state kept between calls (a KV cache written in place),
generation from an artifact."""
