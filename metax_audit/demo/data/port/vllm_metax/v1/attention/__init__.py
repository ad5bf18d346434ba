# Package marker of the demo port.
