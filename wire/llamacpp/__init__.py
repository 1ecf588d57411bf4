"""llama-server's own routes (llama.cpp's tools/server): GET /props, GET /slots, POST
/completion and POST /infill, as a wire format over the chat core."""
