"""`meancache chat`: the Textual chat app."""
