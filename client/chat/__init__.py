"""Chat: conversations, the answer path (pack -> semantic cache -> upstream), documents."""
