"""Verification in tiers: an agent's proposal verified and admitted (``verify``), the expensive tier
of compute-sanitizer and the cheat checks (``checks``), and the gate that says which candidates may be
finals (``gate``, over the study's ``view``)."""
