"""Prompt Cache (Gim et al.): modules' attention states computed once and reused."""
