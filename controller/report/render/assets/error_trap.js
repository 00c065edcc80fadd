// Runs before plotly.js: any script error or rejected promise lands in #js-errors
// (tests/test_html_browser.py reads it). Inlined by controller/report/html.py.
window.__reportErrors=[];
function __reportError(msg){window.__reportErrors.push(String(msg));
 var el=document.getElementById('js-errors');if(el){el.textContent=window.__reportErrors.join('\n');}}
window.onerror=function(m,src,line,col){__reportError(m+' ('+line+':'+col+')');};
window.addEventListener('unhandledrejection',function(ev){__reportError('unhandled rejection: '+ev.reason);});
