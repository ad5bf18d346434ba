# Package marker of the demo upstream.
