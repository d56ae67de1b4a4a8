"""The policy lab: the reference decoder on a real model over a prompt set (CPU)."""
